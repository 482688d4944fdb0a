"""The shared mmap commitlog: mapped files, append, flush, recovery scan."""
