"""Test doubles shared by the tests, the demo and the soak run."""
