"""The apiserver client: REST over urllib3, errors, watch streams, one deadline, credentials."""
