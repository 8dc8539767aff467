"""Deployment helpers: certificates, SuperNode keys, a local TLS federation."""
