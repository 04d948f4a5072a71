package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// minBandwidth is the slowest link rate a bandwidth flag takes, in bytes
// per second: below it a bare number is far more likely a rate in GB/s
// written without its unit (--bandwidth 55 would be 55 B/s, an overhead of
// billions of percent) than a host link.
const minBandwidth = 1e6

// bandwidthHelp is the unit rule every bandwidth flag's help states.
const bandwidthHelp = "bytes per second with a unit: 55GB/s, 55G or 55e9 (K, M, G, T decimal, KiB, MiB, GiB binary; \"/s\" optional); at least 1MB/s"

// rateUnits are the multipliers of a rate's unit, longest suffix first.
// Rates are decimal as links are quoted (55 GB/s is 55e9 bytes a second),
// so the bare K, M, G and T are too; the binary units say so.
var rateUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"kB", 1e3}, {"k", 1e3},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1},
}

// parseBandwidth reads a link rate in bytes per second: "55GB/s", "55G",
// "55 GB/s", "55e9", "55GBps", "51.2GiB/s". A rate in bits ("400Gb/s")
// is refused with the bytes it would be, and so is one below
// minBandwidth: a bare number under it with the rate it was likely meant
// as (55: did you mean 55GB/s?).
func parseBandwidth(s string) (float64, error) {
	in := strings.TrimSpace(s)
	num := in
	for _, per := range []string{"/s", "ps"} {
		if v, ok := strings.CutSuffix(num, per); ok {
			num = strings.TrimSpace(v)
			break
		}
	}
	if v, ok := strings.CutSuffix(num, "bit"); ok {
		num = v + "b"
	}
	if strings.HasSuffix(num, "b") {
		bits := strings.TrimSuffix(num, "b")
		if v, err := parseRate(bits + "B"); err == nil && v > 0 {
			return 0, fmt.Errorf("%q is in bits per second; give bytes per second: %s", s, strings.ReplaceAll(rateString(v/8), " ", ""))
		}
		return 0, fmt.Errorf("%q is in bits per second; give bytes per second with a unit (55GB/s)", s)
	}
	v, err := parseRate(num)
	if err != nil {
		return 0, fmt.Errorf("%q: want %s", s, bandwidthHelp)
	}
	if v <= 0 {
		return 0, fmt.Errorf("%q: the rate must be positive", s)
	}
	if v < minBandwidth {
		if _, err := strconv.ParseFloat(num, 64); err == nil {
			return 0, fmt.Errorf("%q has no unit, so it is %s bytes per second, under the floor of 1MB/s: did you mean %sGB/s (%se9)?", s, num, num, num)
		}
		return 0, fmt.Errorf("%q is %s, under the floor of 1MB/s (the unit is bytes per second: 55GB/s, 55e9)", s, rateString(v))
	}
	return v, nil
}

// parseRate is the number of num times its unit's multiplier.
func parseRate(num string) (float64, error) {
	mult := 1.0
	for _, u := range rateUnits {
		if v, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(v), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("bad rate %q", num)
	}
	v *= mult
	if math.IsInf(v, 0) {
		return 0, fmt.Errorf("rate %q too large", num)
	}
	return v, nil
}

// rateString is v bytes per second as people read a link rate.
func rateString(v float64) string {
	switch {
	case v >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 4, 64) + " GB/s"
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + " MB/s"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + " KB/s"
	}
	return strconv.FormatFloat(v, 'g', 4, 64) + " B/s"
}
