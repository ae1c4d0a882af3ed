/**
 * Chat prompts: the checkpoint's chat template (`tokenizer.chatTemplate`: chat_template.jinja or
 * tokenizer_config.json `chat_template`) rendered with @huggingface/jinja (the Jinja subset HF chat
 * templates use, maintained by Hugging Face; pure JS). The shipped kimi-k3-tiny template is ChatML.
 */

import { Template } from '@huggingface/jinja';

/** One chat message with its text content. */
export interface ChatMessage {
  readonly role: string;
  readonly content: string;
}

/** Thrown when a checkpoint has no chat template or the template fails to render. */
export class ChatTemplateError extends Error {
  override readonly name = 'ChatTemplateError';
}

/** A compiled chat template. */
export class ChatTemplate {
  private readonly template: Template;

  /** @throws {ChatTemplateError} if `source` does not parse. */
  constructor(
    readonly source: string,
    private readonly specials: { bos_token?: string; eos_token?: string } = {},
  ) {
    try {
      this.template = new Template(source);
    } catch (cause) {
      throw new ChatTemplateError(`chat template does not parse: ${(cause as Error).message}`, { cause });
    }
  }

  /** The prompt text for `messages` (with the assistant header when `addGenerationPrompt`). */
  render(messages: readonly ChatMessage[], addGenerationPrompt = true): string {
    try {
      return this.template.render({
        messages: messages.map((m) => ({ role: m.role, content: m.content })),
        add_generation_prompt: addGenerationPrompt,
        bos_token: this.specials.bos_token ?? '',
        eos_token: this.specials.eos_token ?? '',
      });
    } catch (cause) {
      throw new ChatTemplateError(`chat template failed to render: ${(cause as Error).message}`, { cause });
    }
  }
}
