package client

import (
	"net/http"
	"strconv"
)

// APIError is an answer of the admin API that is not 2xx: 400 for a bad
// request (the message names the parameter), 401 for a missing or wrong
// token, 404 for an unknown subscription, event or dead letter, 5xx when
// the sidecar failed (after the retries). Callers inspect it with
// errors.As.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Message is the answer's api.ErrorAnswer message, or the start of
	// its body when it carries none.
	Message string
}

// Error reads like the status line and the message: "404 Not Found: event
// \"x\" ...: not found".
func (e *APIError) Error() string {
	s := strconv.Itoa(e.Status)
	if t := http.StatusText(e.Status); t != "" {
		s += " " + t
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}
