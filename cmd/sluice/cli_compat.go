package main

import "github.com/sluicehq/sluice/config"

// cli.go, which another branch is splitting, still calls the names the
// configuration had in this package. These two keep it compiling until
// that split lands; the merge points cli.go at config.Load and
// config.EnvFile and deletes this file.

// LoadConfig is config.Load.
func LoadConfig(path string, environ []string, overrides map[string]any) (*config.Config, error) {
	return config.Load(path, environ, overrides)
}

// envConfigFile is config.EnvFile.
const envConfigFile = config.EnvFile
