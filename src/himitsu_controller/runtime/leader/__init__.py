"""Leader election on a Lease, and the write gate that stops a replica that lost it."""
