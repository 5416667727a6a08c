"""The one transport interface and its backends (ssh, local, fake), fan-out, probe shipping."""
