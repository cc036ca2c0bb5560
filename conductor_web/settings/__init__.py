"""Settings package: base (shared), local (embedded demo), test, production."""
