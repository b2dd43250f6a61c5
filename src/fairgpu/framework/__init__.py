"""The scheduling cycle, its extension points, profiles and the plugin registry."""
