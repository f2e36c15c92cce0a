
Ö
config_service.protoljrk.controller.v1"
EnableRequest"2
EnableResponse
message (	
success ("
DisableRequest"3
DisableResponse
message (	
success ("
QueryStatusRequest"7
QueryStatusResponse
message (	
enabled (2—
AmpConfigServiceO
Enable!.ljrk.controller.v1.EnableRequest".ljrk.controller.v1.EnableResponseR
Disable".ljrk.controller.v1.DisableRequest#.ljrk.controller.v1.DisableResponse^
QueryStatus&.ljrk.controller.v1.QueryStatusRequest'.ljrk.controller.v1.QueryStatusResponseB-Z+lj-runtimekit/controller/api/proto;configpbbproto3