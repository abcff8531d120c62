//go:build race

package taplink

const raceEnabled = true
