"""Built-in plugins, one module each; `registry.IN_TREE` names them for profiles."""
