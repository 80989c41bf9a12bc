package main

import (
	"github.com/spf13/cobra"

	"github.com/sotercare/jetbridge/internal/cli"
)

// newCompletionCmd is "bridge completion SHELL": the shell-completion
// script of bash, zsh or fish on stdout (docs/operating.md#shell-completion).
// The scripts ask the binary itself ("bridge __complete ...") for the
// commands and flags, so they never go stale.
func newCompletionCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "print the shell-completion script of bash, zsh or fish",
		Long: `Print the script that completes bridge's commands and flags in bash, zsh
or fish. Load it in the current shell, or install it once where the shell
looks for completions (see docs/operating.md#shell-completion). bash needs
the bash-completion package; zsh needs "compinit" in ~/.zshrc.`,
		Example: `  source <(bridge completion bash)
  bridge completion zsh > "${fpath[1]}/_bridge"
  bridge completion fish > ~/.config/fish/completions/bridge.fish`,
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return cli.Usagef("completion needs one shell: bash, zsh or fish (e.g. bridge completion bash)")
			}
			switch args[0] {
			case "bash", "zsh", "fish":
				return nil
			}
			return cli.Usagef("completion: unknown shell %q: want bash, zsh or fish", args[0])
		},
		RunE: func(c *cobra.Command, args []string) error {
			root, w := c.Root(), c.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(w, true)
			case "zsh":
				return root.GenZshCompletion(w)
			default:
				return root.GenFishCompletion(w, true)
			}
		},
	}
	return c
}
