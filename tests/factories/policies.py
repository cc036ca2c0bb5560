"""factory_boy factories for policies."""
