"""Cross-Client Label Propagation (XCLP): label propagation over one graph built from all sites' points.

The numerics live here, pure and synchronous; crypto/ holds the secure sub-protocols; service/ and
clients/ carry the same phase code over HTTP.
"""

__version__ = "0.1.0"
