$5b0c2d3e-0000-4000-8000-00000000abcd".(GPU-00000000-0000-0000-0000-0000000000002 (*'
!CUDA_MPS_ACTIVE_THREAD_PERCENTAGE502 
/usr/local/xdm/opt/xdm/lib:
/dev/nvidia0dev/nvidia0rwBA
xdm.amp.com/allocation-id$5b0c2d3e-0000-4000-8000-00000000abcd