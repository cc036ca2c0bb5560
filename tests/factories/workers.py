"""factory_boy factories for workers."""
