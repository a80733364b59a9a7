"""Optional native CPU kernels (plain C, built once per machine with the system's C compiler)."""
