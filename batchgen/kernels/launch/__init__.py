"""What CUDA kernel launches share: driver launches, programmatic dependent launch, TMA maps, the device."""
