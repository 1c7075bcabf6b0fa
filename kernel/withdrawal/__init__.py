"""Taking a ref back: forget with its receipt and replay check, quarantine and expiry, keys, replicas."""
