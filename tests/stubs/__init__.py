"""Stand-ins for packages whose real behaviour needs a machine the tests do not have."""
