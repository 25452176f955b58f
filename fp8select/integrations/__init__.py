"""Adapters to model libraries. Each module imports its library only when called, never at import."""
