"""Route modules: thin adapters over the Kernel, one module per resource."""
