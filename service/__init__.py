"""The XCLP coordinator: FastAPI routes, persistence and the job engine that runs the server steps."""
