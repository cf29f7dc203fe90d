package policy

// STUB (issue 12): the signatures the proxy and config build on; the
// implementation replaces this file's bodies.

// Filter is a parsed body filter of a subscription: a predicate over the
// event's JSON body with the operators $eq $neq $gt $gte $lt $lte $in $nin
// $exists $startsWith $and $or $not. It is immutable and safe for
// concurrent use.
type Filter struct{}

// ParseFilter parses a filter as decoded from YAML or JSON (a map of a
// dotted path or an operator to a value). Errors name the operator and
// the path.
func ParseFilter(spec map[string]any) (*Filter, error) { return &Filter{}, nil }

// Match reports whether doc (as DecodeDocument returned it) passes f.
func (f *Filter) Match(doc any) bool { return true }

// DecodeDocument decodes an event body for Match, once per event however
// many filters look at it; ok is false for a body that is not JSON, which
// no filter matches.
func DecodeDocument(body []byte) (doc any, ok bool) { return nil, true }
