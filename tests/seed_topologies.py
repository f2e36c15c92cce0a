"""The two verbatim GPU 0 topology examples of the XDM gRPC API reference §3.4
(seed 000): golden fixtures for the parser,
the simulator and the catalog. Kept exactly as the seed prints them."""

M890P_GPU0 = """{"levels": [
  {"level": 1,  "name": "pcieSwitches",    "topo1": [0],  "peers": [0, 1]},
  {"level": 2,  "name": "numaNodes",       "topo2": [0],  "peers": [0, 1]},
  {"level": 3,  "name": "cpuSockets",      "topo3": [0],  "peers": [0, 1, 2, 3]},
  {"level": 11, "name": "hyperNode",       "topo11": "hypernode-001"},
  {"level": 21, "name": "leafSwitch",      "topo21": "asw-001"},
  {"level": 22, "name": "pointOfDelivery", "topo22": "pod-g13-p1"}
]}"""

E810_GPU0 = """{"levels": [
  {"level": 1,  "name": "icnLink2",        "topo1": [0],  "peers": [0, 3]},
  {"level": 2,  "name": "icnLink4",        "topo2": [0],  "peers": [0, 1, 2, 3]},
  {"level": 3,  "name": "icnLink8",        "topo3": [0],  "peers": [0, 1, 2, 3, 4, 5, 6, 7]},
  {"level": 4,  "name": "pcieSwitches",    "topo4": [4],  "peers": [0, 1, 2, 3]},
  {"level": 5,  "name": "numaNodes",       "topo5": [1],  "peers": [0, 1, 2, 3, 8, 9, 10, 11]},
  {"level": 6,  "name": "cpuSockets",      "topo6": [0]},
  {"level": 21, "name": "leafSwitch",      "topo21": "ASW-VM-SQA-G10-P2-S25"},
  {"level": 22, "name": "pointOfDelivery", "topo22": "VM-SQA-G10-P2"}
]}"""
