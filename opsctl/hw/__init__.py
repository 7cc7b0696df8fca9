"""Hardware discovery checks and the hardware quarantine."""
