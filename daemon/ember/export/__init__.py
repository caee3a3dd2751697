"""The durable path to a backend: an on-disk spool and the shippers that
send it, over WriteRaw or OTLP."""
