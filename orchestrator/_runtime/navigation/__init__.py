"""The navigation machine (``machines/navigation.toml``) in one process.

``core`` is what both hosts share; ``driver`` is the navigator (and forking); ``moves`` the pure
decisions over the tree (where the leaf goes, what returns to the editor).
"""
