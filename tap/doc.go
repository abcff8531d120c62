// Package tap opens and configures the exn0 TAP device.
package tap
