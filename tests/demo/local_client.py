"""The API client of the app tests: ``gradio_client.Client`` for a server on this machine."""

from __future__ import annotations

from gradio_client import Client


def local_client(url: str) -> Client:
    """A client of the app served at ``url``, a plain-http address on this machine. TLS verification is off:
    there is no TLS to verify, and with it on gradio_client builds a verifying SSL context, loading the CA
    bundle, for every request and for every file it downloads (a /generate's images), about 0.3 s of CPU in
    each small /generate's 0.8 s round trip (docs/testing.md)."""
    return Client(url, verbose=False, ssl_verify=False)
