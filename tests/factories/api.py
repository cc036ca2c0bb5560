"""factory_boy factories for api."""
