package config

// The fast reader of YAML flow items (yamlflow.go) reads a collection,
// past its opening bracket, with these loops. A key given twice gives up,
// as the reader does on anything unusual (yaml.v3 words the error).

type collectionScanner interface {
	space()
	at(c byte) bool                      // the next byte is c: read it
	key() (string, bool)                 // a key, its colon and the space after
	value() (any, bool)                  // a value, after which next reads on
	next(closing byte) (closed, ok bool) // the separator, or the closing byte
}

func readMapping(p collectionScanner) (any, bool) {
	m := map[string]any{}
	if p.space(); p.at('}') {
		return m, true
	}
	for {
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		if _, dup := m[key]; dup {
			return nil, false
		}
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		m[key] = v
		closed, ok := p.next('}')
		if !ok {
			return nil, false
		}
		if closed {
			return m, true
		}
	}
}

func readSequence(p collectionScanner) (any, bool) {
	l := []any{}
	if p.space(); p.at(']') {
		return l, true
	}
	for {
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		l = append(l, v)
		closed, ok := p.next(']')
		if !ok {
			return nil, false
		}
		if closed {
			return l, true
		}
	}
}
