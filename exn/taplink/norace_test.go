//go:build !race

package taplink

const raceEnabled = false
