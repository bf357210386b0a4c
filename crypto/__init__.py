"""Secure sub-protocols of XCLP, written sans-I/O.

Every protocol here is a state machine or a pure function: it consumes bytes (or arrays) and
produces bytes (or arrays), and never touches a socket, a file or a clock. The in-process
simulation (xclp.simulation) and the networked service (service/, clients/) drive the very same
objects; only the transport differs.
"""
