"""Code generators and runtimes, one subpackage per device (`cpu`: generated C)."""
