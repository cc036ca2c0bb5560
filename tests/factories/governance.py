"""factory_boy factories for governance."""
