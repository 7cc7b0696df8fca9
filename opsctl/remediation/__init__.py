"""remediation."""
