"""The XCLP site agent: talks to the coordinator over HTTP and runs its side of every phase."""
