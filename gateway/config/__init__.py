"""The configuration: typed settings per feature, and the YAML loader."""
