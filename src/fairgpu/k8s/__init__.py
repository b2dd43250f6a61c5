"""The Kubernetes driver: client port, informers, translation, HAMi annotations, controller."""
