"""Real networks for the tests and the benchmarks (issue 36): hosts in network namespaces joined by a
switch (netsim.hosts) and a user-space proxy that adds delay, caps bandwidth, stalls, drops and resets
connections and counts HTTP requests (netsim.proxy). Test and bench tooling only: nothing in xclp/,
crypto/, service/ or clients/ imports it."""
