"""What every room of the package shares: the machine's description (`machine`), files written atomically and a
full device named (`files`), decisions the main process takes for every process of a launch and leaving its group
(`distributed`), the set-up clock (`stages`), the allocator (`allocator`), the output folder's lock (`locks`), the
moments where the fault-injection suite strikes (`faults`), what is published of a run (`redact`), the commands'
parsers, flags only in full (`command_line`), and the attention kernels SDPA may take on CUDA (`kernels`)."""
