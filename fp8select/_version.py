"""The version of fp8select, written once (the package metadata reads it from here)."""

__version__ = "0.1.0"
