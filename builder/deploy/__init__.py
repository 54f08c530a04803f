"""`mbuild deploy`: Kubernetes, Helm and KServe manifests written from a build's plan."""
