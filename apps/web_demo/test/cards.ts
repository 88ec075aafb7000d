/** Hand-written model cards for the unit tests, in the format `keras-attn export` writes. */

export interface CardOptions {
  task?: string;
  labels?: string;
  crf?: string;
  length?: number;
  lowercase?: boolean;
  vocabularySize?: number;
}

/** A card's JSON text; `labels` and `crf` are JSON fragments. */
export function cardText({
  task = "ner",
  labels = '["O", "B-PER", "I-PER"]',
  crf = "null",
  length = 8,
  lowercase = true,
  vocabularySize = 5,
}: CardOptions = {}): string {
  const input = (name: string) => `{"name": "${name}", "dtype": "int32", "shape": [1, ${length}]}`;
  return `{"format": "keras-attn model card 1", "task": "${task}", "labels": ${labels}, "sequence_length": ${length},
    "inputs": [${input("token_ids")}, ${input("segment_ids")}, ${input("padding_mask")}],
    "tokenizer": {"vocabulary_size": ${vocabularySize}, "lowercase": ${lowercase}, "strip_accents": ${lowercase},
                  "cls_token_id": 2, "sep_token_id": 3, "pad_token_id": 0, "unknown_token_id": 1,
                  "max_word_bytes": 100},
    "metrics": {"accuracy": 0.9},
    "crf": ${crf}}`;
}
