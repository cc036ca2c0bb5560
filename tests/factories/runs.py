"""factory_boy factories for runs."""
