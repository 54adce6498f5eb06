"""`swarm dashboard`: a live web page (and Prometheus endpoint) over node data dirs."""
