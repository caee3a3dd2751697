"""The BPF edge: build (bcc, in a child process), load, attach, and drain
ember's programs. Nothing above it sees file descriptors or ctypes."""
