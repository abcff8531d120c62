package testenv

import "slices"

// Median returns the median of v (the mean of the middle two for an even
// count), 0 for none; v is not modified. Benchmarks report it for
// repeated samples.
func Median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
