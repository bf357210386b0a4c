"""The `xclp` command line: the one layer that may import every other (the numerics, the service,
the agent); the demo's process launcher and the progress bar live here too."""
