"""Host ingress: the bounded, nonblocking entry for events produced in Python."""
