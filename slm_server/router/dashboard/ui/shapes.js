// The three API shapes the playground speaks, one entry each: where to send, the
// streamed request's body, and how to read each server-sent event of its answer into
// the sink's text(), thinking(), tool(key, name, argumentsPiece), usage({input,
// output, cached}) and error(message).
"use strict";

const Shapes = (() => {
  const given = (value) => (value === undefined || value === null ? undefined : value);

  function errorText(error, fallback) {
    if (typeof error === "string") return error;
    if (error && typeof error.message === "string") return error.message;
    return fallback;
  }

  const chat = {
    label: "chat completions",
    path: "/v1/chat/completions",
    body: (model, text, maxTokens) => ({
      model,
      messages: [{ role: "user", content: text }],
      max_tokens: maxTokens,
      stream: true,
      stream_options: { include_usage: true },
    }),
    read(_event, data, sink) {
      if (data.error) return sink.error(errorText(data.error, "the stream broke"));
      const choice = Array.isArray(data.choices) ? data.choices[0] : null;
      const delta = choice && choice.delta;
      if (delta) {
        if (delta.reasoning_content) sink.thinking(String(delta.reasoning_content));
        if (delta.content) sink.text(String(delta.content));
        for (const call of delta.tool_calls || []) {
          const fn = call.function || {};
          sink.tool(call.index !== undefined ? call.index : call.id, fn.name, fn.arguments);
        }
      }
      const usage = data.usage;
      if (usage) {
        const details = usage.prompt_tokens_details || {};
        sink.usage({ input: usage.prompt_tokens, output: usage.completion_tokens, cached: details.cached_tokens });
      }
    },
  };

  const responses = {
    label: "Responses",
    path: "/v1/responses",
    body: (model, text, maxTokens) => ({ model, input: text, max_output_tokens: maxTokens, stream: true }),
    read(event, data, sink) {
      const type = data.type || event;
      if (type === "response.output_text.delta") sink.text(String(data.delta || ""));
      else if (type === "response.reasoning_text.delta" || type === "response.reasoning_summary_text.delta") {
        sink.thinking(String(data.delta || ""));
      } else if (type === "response.output_item.added") {
        const item = data.item || {};
        if (item.type === "function_call" || item.type === "custom_tool_call") sink.tool(item.id, item.name, "");
      } else if (type === "response.function_call_arguments.delta" || type === "response.custom_tool_call_input.delta") {
        sink.tool(data.item_id, undefined, data.delta);
      } else if (type === "response.completed" || type === "response.incomplete") {
        const usage = (data.response || {}).usage;
        if (usage) {
          const details = usage.input_tokens_details || {};
          sink.usage({ input: usage.input_tokens, output: usage.output_tokens, cached: details.cached_tokens });
        }
      } else if (type === "response.failed") {
        sink.error(errorText((data.response || {}).error, "the response failed"));
      } else if (type === "error") {
        sink.error(errorText(data.error || data, "the stream broke"));
      }
    },
  };

  const messages = {
    label: "Messages",
    path: "/v1/messages",
    body: (model, text, maxTokens) => ({
      model, max_tokens: maxTokens, messages: [{ role: "user", content: text }], stream: true,
    }),
    read(event, data, sink) {
      const type = data.type || event;
      if (type === "message_start") {
        const usage = (data.message || {}).usage || {};
        sink.usage({ input: given(usage.input_tokens), cached: given(usage.cache_read_input_tokens) });
      } else if (type === "content_block_start") {
        const block = data.content_block || {};
        if (block.type === "tool_use" || block.type === "server_tool_use") sink.tool(data.index, block.name, "");
      } else if (type === "content_block_delta") {
        const delta = data.delta || {};
        if (delta.type === "text_delta") sink.text(String(delta.text || ""));
        else if (delta.type === "thinking_delta") sink.thinking(String(delta.thinking || ""));
        else if (delta.type === "input_json_delta") sink.tool(data.index, undefined, delta.partial_json);
      } else if (type === "message_delta") {
        const usage = data.usage || {};
        sink.usage({
          input: given(usage.input_tokens), output: given(usage.output_tokens),
          cached: given(usage.cache_read_input_tokens),
        });
      } else if (type === "error") {
        sink.error(errorText(data.error, "the stream broke"));
      }
    },
  };

  // One server-sent event's block: its event name and its data parsed (null when the
  // data is not JSON, such as chat's "[DONE]").
  function parseBlock(block) {
    let event = "";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (!data.length) return null;
    try {
      const parsed = JSON.parse(data.join("\n"));
      return parsed && typeof parsed === "object" ? { event, data: parsed } : null;
    } catch (error) {
      return null;
    }
  }

  // The message of an error answer's body (OpenAI's and Anthropic's both have
  // error.message), else its first line.
  function errorMessage(raw, status) {
    try {
      const body = JSON.parse(raw);
      const found = errorText(body.error, null) || errorText(body, null);
      if (found) return found;
    } catch (error) {
      // not JSON: its text is the message
    }
    const line = String(raw).trim().split("\n")[0];
    return line ? line.slice(0, 300) : "HTTP " + status;
  }

  return { chat, responses, messages, parseBlock, errorMessage };
})();
