//go:build race

package main

// raceEnabled reports whether the test binary was built with -race; then the
// fleet tests run their `sluice serve` children from a plain build instead
// of re-executing this (slow, instrumented) binary.
const raceEnabled = true
