"""The custom-call record tests rely on the root conftest's fixtures: every test leaves the
process-wide custom-call table as it found it, so records declared by one test never leak into
another (or into grad.zig's tests, which rely on 'accy.custom.double' having no record), and
compiled programs go to a fresh cache."""
