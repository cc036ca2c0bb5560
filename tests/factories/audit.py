"""factory_boy factories for audit."""
