"""draftgen: exact-token-ID training data for speculative-decoding drafters.

Importing the package is cheap and has no side effects; heavy modules load on first use.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
