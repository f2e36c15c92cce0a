
‚
config_service.protoconfig"
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
enabled (2Ï
AmpConfigService7
Enable.config.EnableRequest.config.EnableResponse:
Disable.config.DisableRequest.config.DisableResponseF
QueryStatus.config.QueryStatusRequest.config.QueryStatusResponseB-Z+lj-runtimekit/controller/api/proto;configpbbproto3